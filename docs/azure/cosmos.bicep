// Azure Cosmos DB (NoSQL API) for celery_durable, for production: create the container here and
// run the store with create=false, e.g.
//
//   az deployment group create -g my-rg -f docs/azure/cosmos.bicep -p accountName=myapp-durable
//   DURABLE_COSMOS_KEY=$(az cosmosdb keys list -g my-rg -n myapp-durable --query primaryMasterKey -o tsv)
//   durable_store = "cosmos://myapp-durable.documents.azure.com/?database=durable&container=durable&create=false"
//
// The store checks the container on first use: partition key /pk with version 2 (large partition
// keys: execution ids can be long), and the indexes of the paths its queries use (the same policy
// as docs/azure/indexing-policy.json and celery_durable/stores/cosmos/provision.py).

@description('Cosmos DB account name (globally unique, lowercase).')
param accountName string

@description('Location of the account.')
param location string = resourceGroup().location

@description('Database name (the store URL\'s database=).')
param databaseName string = 'durable'

@description('Container name (the store URL\'s container=).')
param containerName string = 'durable'

@description('Autoscale maximum RU/s of the container (it scales between 10% and 100% of it).')
@minValue(1000)
param autoscaleMaxThroughput int = 4000

@description('Consistency: Session is enough for one worker fleet in one region; the store uses etags for every decision.')
@allowed([
  'Session'
  'BoundedStaleness'
  'Strong'
])
param consistencyLevel string = 'Session'

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-05-15' = {
  name: accountName
  location: location
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    consistencyPolicy: {
      defaultConsistencyLevel: consistencyLevel
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    disableLocalAuth: false // the store uses the account key, or pass an Azure AD credential= instead
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-05-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
  }
}

resource container 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: database
  name: containerName
  properties: {
    resource: {
      id: containerName
      partitionKey: {
        paths: [
          '/pk'
        ]
        kind: 'Hash'
        version: 2
      }
      indexingPolicy: {
        indexingMode: 'consistent'
        automatic: true
        includedPaths: [
          { path: '/pk/?' }
          { path: '/id/?' }
          { path: '/_ts/?' }
          { path: '/at/?' }
          { path: '/_ix/?' }
          { path: '/b/?' }
          { path: '/workflow/?' }
          { path: '/status/?' }
          { path: '/created_at/?' }
        ]
        excludedPaths: [
          { path: '/*' }
          { path: '/"_etag"/?' }
        ]
      }
    }
    options: {
      autoscaleSettings: {
        maxThroughput: autoscaleMaxThroughput
      }
    }
  }
}

output endpoint string = account.properties.documentEndpoint
output storeUrl string = 'cosmos://${accountName}.documents.azure.com/?database=${databaseName}&container=${containerName}&create=false'
